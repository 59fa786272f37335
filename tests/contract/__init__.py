"""Contract tests: one suite run against every store implementation."""
