"""Moving entries between stores: fetching from and pushing to a remote (replicate), read-only
stores such as prebuilt wheels (tiers), and bundles of entries shipped as files or wheels (bundle)."""
