"""`hvfleet serve`: the Kubernetes-shaped HTTP API for hvfleet.io/v1 (docs/api.md).

One module per job: `app` (routes, `create_app`), `discovery`, `openapi` and
`openapi_proto` (the published schemas), `resources` (object and collection
handlers), `batch` (all-or-nothing writes), `actions` (fleet verbs), `watch`
(the per-kind fan-out) and `watch_stream` (one client's stream), `table`
(Table output), `bodies` (limits, decoding, patches), `status` (errors as
meta/v1 Status), `context` (what handlers share), and `identity` (the
interface to authentication and authorization).
"""
