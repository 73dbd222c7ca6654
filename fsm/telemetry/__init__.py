"""OpenTelemetry traces and metrics for turns, attempts and transitions (optional: nothing is
imported and nothing is paid without ``fallgate[otel]``).
"""
