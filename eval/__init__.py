"""The quality harness: tasks, the eval grid, reports and the frontier (product code, not a benchmark)."""
