"""The results of an audit, as documents and pages: the typed results document
(:mod:`reports.document`) and its CSV/JSON files (:mod:`reports.results`), the HTML report and its
figures (:mod:`reports.html`, :mod:`reports.plots`, :mod:`reports.figures`), the sweep's page, and
the CI gate that holds results to a policy (:mod:`reports.gate`, :mod:`reports.policy`,
:mod:`reports.junit`)."""
