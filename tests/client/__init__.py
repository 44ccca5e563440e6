"""Tests of trainhub.client that need no server."""
