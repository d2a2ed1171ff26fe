"""The papers' comparisons as :class:`audit.reproduce.Study` factories, one module per paper."""

from audit.reproductions import blur_lus, dp_fedsam, fl_top, ldp_fl, udp_fl

STUDIES = {
    "blur-lus": blur_lus.study,
    "dp-fedsam": dp_fedsam.study,
    "udp-fl": udp_fl.study,
    "fl-top": fl_top.study,
    "ldp-fl": ldp_fl.study,
}
