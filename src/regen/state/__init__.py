"""state.db and the owners of its tables (db.py has the map)."""
