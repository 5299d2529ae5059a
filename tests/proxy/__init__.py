"""An nginx auth_request front for end-to-end tests of berth behind an authenticating proxy."""
