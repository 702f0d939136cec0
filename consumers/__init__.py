"""The stage consumer groups: fetch, parse, store and the retry scheduler."""
