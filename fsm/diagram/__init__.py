"""Drawing the declared machine: Mermaid, DOT and SVG, the compact overview, and turns' paths
overlaid on it.
"""
