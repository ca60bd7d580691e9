"""The map database (SQLite): schema, stored arrays, writer thread, recorder, readback, resume."""
