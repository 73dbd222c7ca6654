"""The pure engine: the one declaration of the turn machine, its guards, effects and
observations, the turn's state (and its trace events), and the turn that is fed outcomes
and returns actions.
"""
