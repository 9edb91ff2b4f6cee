"""The test suite as a package, so its helper modules import as `tests.fake_server`, `tests.helpers`
instead of through pytest putting tests/ on sys.path."""
