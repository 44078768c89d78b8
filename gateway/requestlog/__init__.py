"""The request log in the accounts database: a row per request, its bodies where captured."""
