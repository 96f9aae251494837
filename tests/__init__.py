"""The test suite; tests/helpers holds what several test folders share."""
