"""Notifications: email and webhooks for approvals, alerts and escalations."""
