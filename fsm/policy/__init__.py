"""The policy: the chain of targets, their keys, how each outcome kind is handled, and how a
policy is loaded from TOML / JSON / dict data and checked field by field.
"""
