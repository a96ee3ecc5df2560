"""The `rollout` command line: one module per subcommand."""
