// Package node is the rejoin node process: see CONTRACT.md until doc is written.
package node
