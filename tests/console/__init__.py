"""The console and observability: its HTTP server and API, the browser, Prometheus metrics, the shipped dashboards and rules."""
