"""The stored records of hvfleet's Placement API: resource providers that are
not hypervisors (a client's POST /resource_providers, sharing storage, a NIC's
bandwidth) and the Placement facts of hypervisor providers that libvirt does
not give (traits, aggregates, a generation), Placement consumers, and the
custom resource classes and traits clients create.

They are stored kinds like AccessToken: every backend holds them, the
Kubernetes-shaped API does not serve them (the Placement API under
/placement does, through hvfleet.placement). Allocations on a stored provider
live in that provider's record, so one atomic batch write of the providers a
consumer touches is Placement's "generation compare-and-swap on every
provider" (hvfleet.store.base.Store.write_all); allocations on a hypervisor
are Reservations (hvfleet.placement.allocations)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hvfleet.model.bounds import MAX_LIST, MAX_RESOURCES
from hvfleet.model.meta import Model, NoStatus, StoredObject

MAX_INT = 2147483647
# Consumers with allocations on one stored provider (a sharing storage pool
# may serve thousands of instances; the record stays well inside etcd's 1.5 MiB).
MAX_CONSUMERS = 10_000
# resource class -> amount allocated
Amounts = Annotated[dict[str, Annotated[int, Field(ge=0, le=MAX_INT)]], Field(max_length=MAX_RESOURCES)]


class PlacementInventory(Model):
    total: int = Field(ge=0, le=MAX_INT)
    reserved: int = Field(default=0, ge=0, le=MAX_INT)
    min_unit: int = Field(default=1, ge=1, le=MAX_INT)
    max_unit: int = Field(default=MAX_INT, ge=1, le=MAX_INT)
    step_size: int = Field(default=1, ge=1, le=MAX_INT)
    allocation_ratio: float = Field(default=1.0, ge=0, le=3.40282e38)


class ResourceProviderSpec(Model):
    # The provider's Placement name (any text up to 200 characters);
    # metadata.name is its uuid.
    provider_name: str = Field(default="", max_length=200)
    parent_uuid: str | None = None
    root_uuid: str = ""
    generation: int = Field(default=0, ge=0, le=2**63 - 1)
    # Set on the record of a hypervisor provider: its traits, aggregates and
    # generation live here; its inventories and allocations are the hypervisor's.
    hypervisor: str | None = None
    inventories: dict[str, PlacementInventory] = Field(default_factory=dict, max_length=MAX_RESOURCES)
    traits: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    aggregates: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    # consumer uuid -> resource class -> amount
    allocations: dict[str, Amounts] = Field(default_factory=dict, max_length=MAX_CONSUMERS)
    created_at: str = ""
    updated_at: str = ""


class ResourceProvider(StoredObject):
    kind: Literal["ResourceProvider"] = "ResourceProvider"
    spec: ResourceProviderSpec = Field(default_factory=ResourceProviderSpec)
    status: NoStatus = Field(default_factory=NoStatus)


class PlacementConsumerSpec(Model):
    project_id: str = Field(default="", max_length=255)
    user_id: str = Field(default="", max_length=255)
    consumer_type: str | None = Field(default=None, max_length=255)
    generation: int = Field(default=0, ge=0, le=2**63 - 1)
    # The stored providers and the hypervisors this consumer has allocations on.
    providers: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    hypervisors: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    created_at: str = ""
    updated_at: str = ""


class PlacementConsumer(StoredObject):
    kind: Literal["PlacementConsumer"] = "PlacementConsumer"
    spec: PlacementConsumerSpec = Field(default_factory=PlacementConsumerSpec)
    status: NoStatus = Field(default_factory=NoStatus)


class PlacementNameSpec(Model):
    # "trait" or "resource-class"; `name` is the CUSTOM_* name itself.
    of: Literal["trait", "resource-class"]
    placement_name: str = Field(max_length=255)
    created_at: str = ""
    updated_at: str = ""


class PlacementName(StoredObject):
    """A custom trait or resource class a client created."""

    kind: Literal["PlacementName"] = "PlacementName"
    spec: PlacementNameSpec
    status: NoStatus = Field(default_factory=NoStatus)


PLACEMENT_KINDS: dict[str, type[ResourceProvider | PlacementConsumer | PlacementName]] = {
    "ResourceProvider": ResourceProvider,
    "PlacementConsumer": PlacementConsumer,
    "PlacementName": PlacementName,
}
