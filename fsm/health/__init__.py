"""What outlives a turn: the health store (breakers, budgets, cooldowns), its records, and the
shared store over a fleet's backend.
"""
