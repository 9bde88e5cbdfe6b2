"""The engine: sending requests (client), their limits and pool, the budgets and holds
that admit them, and what the provider bills."""
