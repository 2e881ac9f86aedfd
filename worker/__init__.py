"""The job worker: takes queued runs from the store and executes them (in-app thread or standalone)."""
