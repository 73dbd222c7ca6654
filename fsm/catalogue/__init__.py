"""What a provider meant: the registry of known providers, error-body wordings and codes,
Retry-After parsing, and the status rules that turn a status, headers and body into one
`Outcome` (`classify`: the one entry the SDK-exception reader calls).
"""
