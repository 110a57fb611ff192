// Package faultnet is a TCP relay on loopback for fault injection in
// tests: put a Proxy between a client and a server, then Freeze it to
// hold every byte in both directions (packets vanish, connections stay
// open, as in a partition or a stalled process) or Thaw it to let them
// through again, or Reset it to have the kernel reset every connection
// through it, and every new one for a while.
package faultnet
