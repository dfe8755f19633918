"""The `hvfleet` console script and the opt-in warm worker behind it: a process
that has imported every command family and forks a child per command, so a
command runs without Python's and hvfleet's start-up (docs/cli.md). It uses
the CLI only through its entry point, `hvfleet.cli.entry`."""
