package certs

// AdminName is the client name of the admin identity, client:root
// (rejoin://client/root): the holder of its certificate may use a node's
// fault points and profiles (docs/DESIGN.md "Who may talk to a node").
// `rejoin cert create-client root` issues it.
const AdminName = "root"

// IsAdmin reports whether id is the admin identity.
func (id Identity) IsAdmin() bool { return id.Role == RoleClient && id.Name == AdminName }
