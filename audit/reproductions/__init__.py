"""The papers' comparisons as :class:`audit.reproduce.Study` factories, one module per paper."""

from audit.reproductions import blur_lus, dp_fedsam, udp_fl

STUDIES = {
    "blur-lus": blur_lus.study,
    "dp-fedsam": dp_fedsam.study,
    "udp-fl": udp_fl.study,
}
