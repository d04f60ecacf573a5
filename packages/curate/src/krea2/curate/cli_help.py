"""Help texts of options that several ``krea2 curate`` commands share."""

CLUSTER_HELP = "Cluster file or comma-separated DSNs (default: $KRABLET_CLUSTER)."
CONFIG_HELP = "TOML file of curate settings (see docs/curate.md); merged onto the defaults."
SET_HELP = "Override a setting, e.g. --set stages.256.max_aspect=2.5 (repeatable)."
