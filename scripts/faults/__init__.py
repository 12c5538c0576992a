"""Fault-campaign helpers (scripts/fault_campaign.py): probes, their subprocess runner and the families."""
