"""Builders of trial environments (the port is ``trainhub.service.environments``)."""
