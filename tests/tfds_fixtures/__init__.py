"""TFDS builders of the tests, inside a package as TFDS's own catalogue builders are (which is
what makes TFDS's preparation reach ``importlib_resources``)."""
