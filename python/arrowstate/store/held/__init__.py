"""The partition states a worker holds between tasks, under its memory budget.

- `states`: `HeldStates`, which held state a task may take again, the store a new one
  lives in, the cap, and the upkeep after each commit;
- `budget`: `MemoryBudget`, how much state stays in memory, where the rest goes, and the
  process memory figures it checks.
"""
