package supervise

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd's own authentication, with a role for each kind of identity
// (docs/DESIGN.md "Who may write etcd"). With client-certificate auth,
// etcd takes a client certificate's CommonName as the user, and `rejoin
// cert` writes the identity there: "node:n3", "client:root".
const (
	// RoleNode is every node's role: read all of /rejoin/, write what a
	// node, an executor and the supervisor it may become write.
	RoleNode = "rejoin-node"
	// RoleClient reads /rejoin/ and writes nothing.
	RoleClient = "rejoin-client"
	// roleNodeOwn prefixes the role of one node's own records.
	roleNodeOwn = "rejoin-node-"
	// rootUser and rootRole are etcd's: auth cannot be enabled without
	// a user root holding role root, which may do anything.
	rootUser = "root"
	rootRole = "root"
	// AdminClient is the client name whose certificate is the cluster's
	// admin (`rejoin cert create-client root`): it holds etcd's root role
	// and runs init, replace, drain, rebalance and undo-move.
	AdminClient = "root"
	tasksPrefix = keyRoot + "tasks/"
)

// NodeUser is the etcd user of node id's certificate.
func NodeUser(id string) string { return "node:" + id }

// ClientUser is the etcd user of client name's certificate.
func ClientUser(name string) string { return "client:" + name }

// grant is one permission of a role: a key, or a prefix.
type grant struct {
	key    string
	prefix bool
	perm   authpb.Permission_Type
}

// nodeGrants are RoleNode's. Prefix permissions cannot say "the node's
// own": a replica record's key ends in its node, and the supervisor any
// node may become writes every node's record, assignment and claim. What
// a node may not write: the cluster's config and init token, the moves,
// the bootstrap mark, other nodes' incarnations.
var nodeGrants = []grant{
	{keyRoot, true, clientv3.PermRead},
	{nodesPrefix, true, clientv3.PermReadWrite},
	{replicasPrefix, true, clientv3.PermReadWrite},
	{outPrefix, true, clientv3.PermReadWrite},
	{assignPrefix, true, clientv3.PermReadWrite},
	{claimsPrefix, true, clientv3.PermReadWrite},
	{tasksPrefix, true, clientv3.PermReadWrite},
	{electionPrefix + "/", true, clientv3.PermReadWrite},
}

var clientGrants = []grant{{keyRoot, true, clientv3.PermRead}}

// Access is what SetupAccess sets up.
type Access struct {
	// Nodes are node ids ("n3") given a user with RoleNode and a role of
	// their own (their incarnation record).
	Nodes []string
	// Clients are client names given a user with RoleClient.
	Clients []string
	// Admins are client names given etcd's root role; AdminClient always is.
	Admins []string
	// Enable turns etcd's authentication on if it is off. Without it,
	// an etcd with auth off gets its users and roles, unenforced.
	Enable bool
}

// SetupAccess creates the roles, the root user and the users of a, and
// with a.Enable turns authentication on, last: until then every client
// may do anything, after it only what its user's roles grant. Each step
// is idempotent, so a setup run again (an interrupted one, or to add a
// node's user) completes what is there. With auth on, the caller must be
// an admin (etcd's root role).
func SetupAccess(ctx context.Context, cli *clientv3.Client, a Access) error {
	roles := map[string][]grant{RoleNode: nodeGrants, RoleClient: clientGrants}
	users := map[string][]string{rootUser: {rootRole}}
	for _, name := range append([]string{AdminClient}, a.Admins...) {
		users[ClientUser(name)] = []string{rootRole}
	}
	for _, name := range a.Clients {
		if _, admin := users[ClientUser(name)]; !admin {
			users[ClientUser(name)] = []string{RoleClient}
		}
	}
	for _, id := range a.Nodes {
		if err := checkID("node id", id, nodeIDBytesMax); err != nil {
			return err
		}
		own := roleNodeOwn + id
		roles[own] = []grant{{IncarnationKey(id), false, clientv3.PermReadWrite}}
		users[NodeUser(id)] = []string{RoleNode, own}
	}
	if err := ensureRole(ctx, cli, rootRole, nil); err != nil {
		return err
	}
	for _, name := range sortedKeys(roles) {
		if err := ensureRole(ctx, cli, name, roles[name]); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(users) {
		if err := ensureUser(ctx, cli, name, users[name]); err != nil {
			return err
		}
	}
	if !a.Enable {
		return nil
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("supervise: enable etcd's authentication: %w", err)
	}
	return nil
}

// AuthEnabled reports whether etcd enforces its authentication.
func AuthEnabled(ctx context.Context, cli *clientv3.Client) (bool, error) {
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("supervise: etcd's auth status: %w", err)
	}
	return st.Enabled, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ensureRole adds role name with grants, writing only what is missing:
// every change to etcd's auth data fails the requests in flight under the
// older data once (the client retries them), so a setup run again on a
// running cluster changes nothing it need not.
func ensureRole(ctx context.Context, cli *clientv3.Client, name string, grants []grant) error {
	var have []*authpb.Permission
	got, err := cli.RoleGet(ctx, name)
	switch {
	case err == nil:
		have = got.Perm
	case errors.Is(err, rpctypes.ErrRoleNotFound):
		if _, err := cli.RoleAdd(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return fmt.Errorf("supervise: add etcd role %s: %w", name, err)
		}
	default:
		return fmt.Errorf("supervise: read etcd role %s: %w", name, err)
	}
	for _, g := range grants {
		end := ""
		if g.prefix {
			end = clientv3.GetPrefixRangeEnd(g.key)
		}
		if slices.ContainsFunc(have, func(p *authpb.Permission) bool {
			return string(p.Key) == g.key && string(p.RangeEnd) == end && p.PermType == g.perm
		}) {
			continue
		}
		if _, err := cli.RoleGrantPermission(ctx, name, g.key, end, clientv3.PermissionType(g.perm)); err != nil {
			return fmt.Errorf("supervise: grant etcd role %s %s on %s: %w", name, g.perm, g.key, err)
		}
	}
	return nil
}

// ensureUser adds a user without a password (it is reached through its
// certificate only) and grants it roles, writing only what is missing.
func ensureUser(ctx context.Context, cli *clientv3.Client, name string, roles []string) error {
	var have []string
	got, err := cli.UserGet(ctx, name)
	switch {
	case err == nil:
		have = got.Roles
	case errors.Is(err, rpctypes.ErrUserNotFound):
		_, err := cli.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true})
		if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return fmt.Errorf("supervise: add etcd user %s: %w", name, err)
		}
	default:
		return fmt.Errorf("supervise: read etcd user %s: %w", name, err)
	}
	for _, r := range roles {
		if slices.Contains(have, r) {
			continue
		}
		if _, err := cli.UserGrantRole(ctx, name, r); err != nil {
			return fmt.Errorf("supervise: grant etcd user %s role %s: %w", name, r, err)
		}
	}
	return nil
}
