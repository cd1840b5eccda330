"""Typer commands only: parse flags, call one function, print. Heavy modules are imported inside commands."""
