"""dsv4moe: Python helpers around the dsv4moe tool (docs/engines.md). Importing the package
imports nothing heavy; `dsv4moe.testing` needs NumPy."""
