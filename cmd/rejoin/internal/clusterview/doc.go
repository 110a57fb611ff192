// Package clusterview reads what a running cluster says about itself, from
// etcd (nodes, placement, rejoin tasks, assignments) and from each live
// node's admin HTTP GET /status, and renders it as tables. `rejoin status`
// prints it; `rejoin demo` polls it to wait and to draw its progress bars.
package clusterview
