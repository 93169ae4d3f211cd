"""Every setting (config.VARIABLES), the files they may be kept in (settings_file), where each may
come from (setting_sources: what widens trust comes from the environment and the user's own file),
and the ownership policy a store and a settings file are checked against (owners)."""
