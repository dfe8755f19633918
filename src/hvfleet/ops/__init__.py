"""The operations every edge offers, each as a typed request in and a typed
answer out (docs/architecture.md).

The CLI, the Kubernetes-shaped API and the dashboard are thin edges over this
package: each maps its input (options, a JSON body, a form) to the same plain
dict, parses it here into the operation's request, calls the operation, and
renders the answer's one document (JSON) or its one table (people). So the
three edges cannot drift: a request is parsed in one place and an answer built
in one place. Authorization, transport and output formats stay at the edges.
"""
