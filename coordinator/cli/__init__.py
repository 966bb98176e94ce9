"""The zkgroups command-line tools; :mod:`coordinator.cli.common` holds what they share."""
