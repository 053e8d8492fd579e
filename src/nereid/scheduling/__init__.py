"""Schedulers: how queued requests of one model version reach its instances."""
