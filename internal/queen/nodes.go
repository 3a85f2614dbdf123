package queen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/apiary-llm/apiary/internal/api"
	"github.com/apiary-llm/apiary/internal/fleet"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/store"
)

// The SSH nodes the queen starts hives on: GET, POST /api/admin/nodes and
// DELETE /api/admin/nodes/{name}. Adding a node probes it over SSH before
// anything is saved; the queen then keeps a hive running there (fleet.go)
// until the node is removed or the queen stops.

// nodeNamePattern: a node's name is also its pool id.
var nodeNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`) // at most 63 bytes; see idPattern

func checkNodeName(name string) error {
	if len(name) > 63 || !nodeNamePattern.MatchString(name) {
		return api.BadRequest("node name %q is not valid: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if name == LocalPoolID {
		return api.BadRequest("node name %q is reserved for the queen's own local hive", name)
	}
	return nil
}

// sshError turns an sshnode failure into the answer of the admin API.
func sshError(err error) error {
	code, status := "ssh_failed", http.StatusBadGateway
	switch {
	case errors.Is(err, sshnode.ErrBadTarget):
		code, status = "invalid_request", http.StatusBadRequest
	case errors.Is(err, sshnode.ErrNoClient):
		code, status = "ssh_client_missing", http.StatusServiceUnavailable
	case errors.Is(err, sshnode.ErrTimeout):
		code, status = "ssh_timeout", http.StatusGatewayTimeout
	case errors.Is(err, sshnode.ErrHostKey):
		code = "ssh_host_key_unknown"
	case errors.Is(err, sshnode.ErrAuth):
		code = "ssh_auth_failed"
	case errors.Is(err, sshnode.ErrUnreachable):
		code = "ssh_unreachable"
	case errors.Is(err, sshnode.ErrMissingBinary):
		code, status = "apiary_missing", http.StatusUnprocessableEntity
	}
	return &api.RequestError{Status: status, Code: code, Err: err}
}

func (q *Queen) getNodes(w http.ResponseWriter, r *http.Request, _ caller) error {
	if _, err := query(r); err != nil {
		return err
	}
	var nodes []store.Node
	if err := q.st.View(r.Context(), func(tx *store.Tx) (err error) { nodes, err = tx.Nodes(); return err }); err != nil {
		return err
	}
	out := api.NodeList{Nodes: q.fleet.LocalNodes()}
	for _, n := range nodes {
		if live, ok := q.fleet.Node(n.Name); ok {
			out.Nodes = append(out.Nodes, live)
			continue
		}
		spec, _ := fleet.SpecOf(n)
		out.Nodes = append(out.Nodes, api.Node{Name: n.Name, SSH: n.SSHTarget, InstallDir: n.InstallDir, HivePort: spec.HivePort(),
			CreatedAt: n.CreatedAt.UTC(), PoolID: n.Name, Hive: api.NodeHive{State: api.HiveStopped}})
	}
	if out.Nodes == nil {
		out.Nodes = []api.Node{}
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (q *Queen) postNode(w http.ResponseWriter, r *http.Request, c caller) error {
	var req api.AddNodeRequest
	if err := api.Decode(r, &req, false); err != nil {
		return err
	}
	if err := checkNodeName(req.Name); err != nil {
		return err
	}
	target, err := sshnode.ParseTarget(req.SSH)
	if err != nil {
		return api.BadRequest("ssh: %v", err)
	}
	dir := req.InstallDir
	if dir == "" {
		dir = sshnode.DefaultInstallDir
	}
	if err := sshnode.CheckInstallDir(dir); err != nil {
		return api.BadRequest("install_dir: %v", err)
	}
	port := DefaultHivePort
	if req.HivePort != nil {
		if *req.HivePort < 0 || *req.HivePort > 65535 {
			return api.BadRequest("hive_port %d is not a port (0: any free port)", *req.HivePort)
		}
		port = *req.HivePort
	}
	tlsFiles := fleet.TLS{Cert: req.TLSCert, Key: req.TLSKey, CAFile: req.CAFile}
	if err := q.checkNodeTLS(tlsFiles); err != nil {
		return err
	}
	reason := "node added"
	if strings.TrimSpace(req.Reason) != "" {
		if reason, err = checkReason(req.Reason); err != nil {
			return err
		}
	}
	if q.fleet.Stopped() {
		return fmt.Errorf("%w: not adding node %s", ErrShuttingDown, req.Name)
	}
	if _, ok := q.fleet.Node(req.Name); ok {
		return &api.RequestError{Status: http.StatusConflict, Code: "node_exists", Err: fmt.Errorf("node %s exists; remove it first", req.Name)}
	}

	// Probe before saving: a node that cannot run a hive is not added.
	ctx, cancel := context.WithTimeout(r.Context(), q.cfg.Ownership.ProbeTimeout)
	defer cancel()
	probe, err := q.cfg.Ownership.SSH.Probe(ctx, target, dir)
	if err != nil {
		return sshError(err)
	}
	bin, err := q.fleet.Binary()
	if err != nil {
		return err
	}
	if !probe.Installed(bin) {
		if cerr := probe.CanCopy(bin); cerr != nil {
			return sshError(&sshnode.Error{Kind: sshnode.ErrMissingBinary, Target: target,
				Hint: fmt.Sprintf("%v, and it has no apiary %s at %s: install it there", cerr, bin.Version, probe.InstallDir)})
		}
	}
	if err := q.fleet.Reachable(req.Name, probe.NodeAddr); err != nil {
		return &api.RequestError{Status: http.StatusConflict, Code: "node_unreachable_from_queen", Err: err}
	}

	meta, _ := json.Marshal(fleet.Meta{HivePort: port, TLS: tlsFiles})
	n := store.Node{Name: req.Name, SSHTarget: target.String(), InstallDir: dir, CreatedAt: micro(time.Now()), Metadata: meta}
	err = q.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.InsertNode(n); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{Actor: c.actor, Action: "node.add", Target: "node:" + n.Name, Reason: reason,
			Metadata: map[string]any{"ssh": n.SSHTarget, "install_dir": dir, "hive_port": port, "os": probe.OS, "arch": probe.Arch,
				"node_addr": probe.NodeAddr, "installed_version": probe.Version}})
		return err
	})
	if errors.Is(err, store.ErrExists) {
		return &api.RequestError{Status: http.StatusConflict, Code: "node_exists", Err: fmt.Errorf("node %s exists; remove it first", req.Name)}
	}
	if err != nil {
		return err
	}
	spec, err := fleet.SpecOf(n)
	if err != nil {
		return err
	}
	if err := q.fleet.Add(spec); err != nil {
		return err
	}
	q.log.Info("node added", "node", n.Name, "ssh", n.SSHTarget, "node_addr", probe.NodeAddr, "os", probe.OS, "arch", probe.Arch)
	out, _ := q.fleet.Node(n.Name)
	api.WriteJSON(w, http.StatusCreated, out)
	return nil
}

func (q *Queen) deleteNode(w http.ResponseWriter, r *http.Request, c caller) error {
	name := r.PathValue("name")
	if name == LocalPoolID {
		return api.BadRequest("the local hive is the queen's own; it stops with the queen")
	}
	if err := checkNodeName(name); err != nil {
		return err
	}
	reason, _, err := poolAction(r, "node removed")
	if err != nil {
		return err
	}
	var stored *store.Node
	if err := q.st.View(r.Context(), func(tx *store.Tx) error {
		nodes, err := tx.Nodes()
		for i := range nodes {
			if nodes[i].Name == name {
				stored = &nodes[i]
			}
		}
		return err
	}); err != nil {
		return err
	}
	if stored == nil {
		return &api.RequestError{Status: http.StatusNotFound, Code: "node_not_found", Err: fmt.Errorf("no node %s (see GET /api/admin/nodes)", name)}
	}
	// Stop first (the hive cascades to its workers), then forget: a queen
	// that dies in between starts the hive again rather than orphan it.
	out, _ := q.fleet.Node(name)
	q.fleet.Remove(name)
	if after, ok := q.fleet.Node(name); ok {
		out = after
	}
	out.Hive.State, out.Hive.PID = api.HiveStopped, 0
	wctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	err = q.st.Update(wctx, func(tx *store.Tx) error {
		if err := tx.DeleteNode(name); err != nil {
			return err
		}
		_, err := tx.Append(store.AuditEntry{Actor: c.actor, Action: "node.remove", Target: "node:" + name, Reason: reason,
			Metadata: map[string]any{"ssh": stored.SSHTarget}})
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return &api.RequestError{Status: http.StatusNotFound, Code: "node_not_found", Err: fmt.Errorf("no node %s", name)}
	}
	if err != nil {
		return err
	}
	q.log.Info("node removed", "node", name, "reason", reason)
	if out.Name == "" {
		spec, _ := fleet.SpecOf(*stored)
		out = api.Node{Name: name, SSH: stored.SSHTarget, InstallDir: stored.InstallDir, HivePort: spec.HivePort(), CreatedAt: stored.CreatedAt.UTC(),
			PoolID: name, Hive: api.NodeHive{State: api.HiveStopped}}
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// checkNodeTLS checks a node's TLS files: both or neither of certificate
// and key, paths fit for its command line, and a certificate whenever the
// queen serves TLS (a hive that serves plain HTTP would carry the cluster
// token and prompts in clear).
func (q *Queen) checkNodeTLS(t fleet.TLS) error {
	if (t.Cert == "") != (t.Key == "") {
		return api.BadRequest("tls_cert and tls_key go together: give both or neither")
	}
	if q.cfg.TLS.Enabled() && t.Cert == "" {
		return api.BadRequest("the queen serves TLS: give the node's certificate and key (tls_cert, tls_key: paths on the node)")
	}
	for what, p := range map[string]string{"tls_cert": t.Cert, "tls_key": t.Key, "ca_file": t.CAFile} {
		if p == "" {
			continue
		}
		if err := sshnode.CheckPath(what, p); err != nil {
			return api.BadRequest("%v", err)
		}
	}
	return nil
}
