"""Support code of the test suite (not tests): shared references and tolerances."""
