"""Test configuration: fixtures come from plugins, one per kind of resource."""

pytest_plugins = ("tests.fixtures.servers", "tests.fixtures.fleet")
