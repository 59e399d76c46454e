"""berth's tests, in folders by what they start (CONTRIBUTING.md, "Set up and run the tests")."""
