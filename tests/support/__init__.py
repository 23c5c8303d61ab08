"""What several test files share: model specs, prompts, reference statistics, HTTP
clients. Shared fixtures live in tests/conftest.py; a test file imports from here,
never from another test file (tests/test_code_health.py checks it)."""
