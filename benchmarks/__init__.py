"""asv benchmark suites of numbasep (see README.md in this folder)."""
