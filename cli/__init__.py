"""The command line: `sketchwalk COMMAND`, one module per command (registered in main)."""
