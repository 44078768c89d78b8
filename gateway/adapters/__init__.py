"""Providers made to serve what they cannot as they are: `Provider` decorators, each the same
shape in and out, built once per config snapshot (`stack.adapted`)."""
