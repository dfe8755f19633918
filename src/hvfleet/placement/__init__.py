"""The core of hvfleet's OpenStack Placement API: resource providers, their
inventories, traits, aggregates, allocations and usages as Placement defines
them, computed from the fleet's own objects. Pure of HTTP: the edge in
`hvfleet.server.placement` parses requests, calls this package and renders."""
