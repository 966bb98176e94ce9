"""Pure logic, no server and no process: each file tests one module's functions from tables and properties (the fast subset)."""
