"""Processes: who am I (env), starting workers (launch), collectives on flat buffers."""
