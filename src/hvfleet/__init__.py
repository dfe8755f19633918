"""hvfleet: a live, trustworthy picture of a libvirt/KVM fleet."""

__version__ = "0.1.0"
