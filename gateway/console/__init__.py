"""The web console at `/ui`: static pages that call the admin API, signed in with an admin key
or single sign-on (OIDC), each person's session a row of the accounts database."""
