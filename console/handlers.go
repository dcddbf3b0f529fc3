package console

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

type loginBody struct {
	Next string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	d := &pageData{Title: "Log in", Nav: "login", page: "login", AuthOff: s.auth == nil,
		Body: loginBody{Next: localPath(r.URL.Query().Get("next"), Prefix)}}
	s.render(w, http.StatusOK, d)
}

// login checks the token once and starts a session that keeps it in memory; the
// browser gets only the session id.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	next := localPath(r.PostFormValue("next"), Prefix)
	if s.origin.Check(r) != nil {
		s.renderError(w, r, http.StatusForbidden, "This login came from another site and was refused.")
		return
	}
	if s.auth == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	p, err := s.auth.Authenticate(token)
	if err != nil {
		// Anyone may send a login: a refused one is logged once a second at most.
		if log, suppressed := s.loginRefusals.Admit(time.Now()); log {
			s.log.Info("console: login refused", "remote", r.RemoteAddr, "suppressed", suppressed)
		}
		d := &pageData{Title: "Log in", Nav: "login", page: "login", Body: loginBody{Next: next},
			Err: &uiError{Code: idemkv.CodeUnauthenticated, Message: "That token is not valid."}}
		s.render(w, http.StatusUnauthorized, d)
		return
	}
	sess := s.sessions.start(token, p.Name, time.Now())
	s.setCookie(w, r, sess)
	s.log.Info("console: login", "token", p.Name, "role", string(p.Role), "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, v viewer) (string, notice) {
	s.sessions.end(v.sess.id)
	clearCookie(w, r)
	return Prefix + "login", notice{}
}

type overviewBody struct {
	Cluster      *idemkv.ClusterInfo
	Nodes        []nodeView
	ClusterErr   *uiError
	Metrics      *nodeMetrics
	MetricsErr   *uiError
	Tools        []toolRate
	RateSpan     time.Duration
	ConflictsNow int
}

func (s *Server) overview(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page, d.Refresh = "Overview", "overview", "overview", 15
	var b overviewBody
	info, nodes, err := s.clusterView(r.Context(), r, v)
	b.Cluster, b.Nodes, b.ClusterErr = info, nodes, describeRead(err)
	m, err := s.metrics(r.Context(), r, v)
	b.Metrics, b.MetricsErr = m, describeRead(err)
	if m != nil {
		b.Tools, b.RateSpan = s.rates.observe(time.Now(), m.Decisions)
	}
	b.ConflictsNow = s.conflicts.count(func(e *ConflictEntry) bool { return v.may(api.OpRead, e.Tenant) })
	d.Body = b
}

// listBody is a page of records with what the viewer may do to them.
type listBody struct {
	Tenant   string
	Choices  []string
	Every    bool
	Prefix   string
	Status   string
	Records  []*idemkv.Record
	Next     string
	Asked    bool
	CanWrite map[string]bool // by tenant
	CanVote  map[string]bool
	Return   string
	Approver bool // the form asks who approves (authentication off)
}

func (b *listBody) allow(v viewer) {
	b.CanWrite, b.CanVote = map[string]bool{}, map[string]bool{}
	for _, rec := range b.Records {
		b.CanWrite[rec.Tenant] = v.may(api.OpWrite, rec.Tenant)
		b.CanVote[rec.Tenant] = v.may(api.OpApprove, rec.Tenant)
	}
}

func (s *Server) inDoubt(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page = "In doubt", "in-doubt", "in-doubt"
	tenant, choices := tenantChoice(r, v)
	_, every := v.tenants()
	b := listBody{Tenant: tenant, Choices: choices, Every: every, Return: r.URL.RequestURI()}
	after := r.URL.Query().Get("after")
	c := s.apiClient(r, v)
	var res *idemkv.ListResult
	var err error
	switch {
	case tenant != "":
		b.Asked = true
		res, err = c.List(r.Context(), &idemkv.ListRequest{Tenant: tenant, InDoubt: true, Limit: pageSize, After: after})
	case v.may(api.OpListEveryTenant, ""):
		b.Asked = true
		res, err = c.ListInDoubt(r.Context(), &idemkv.InDoubtRequest{Limit: pageSize, After: after})
	}
	d.Err = describeRead(err)
	if res != nil {
		b.Records, b.Next = res.Records, res.Next
	}
	b.allow(v)
	d.Body = b
}

// resolve settles an in-doubt record: committed with the receipt the operator found
// downstream, or not executed (the key is released).
func (s *Server) resolve(_ http.ResponseWriter, r *http.Request, v viewer) (string, notice) {
	back := localPath(r.PostFormValue("next"), Prefix+"in-doubt")
	req := &idemkv.ResolveRequest{
		Tenant: r.PostFormValue("tenant"), Key: r.PostFormValue("key"), Fingerprint: r.PostFormValue("fingerprint"),
		Outcome: idemkv.ResolveOutcome(r.PostFormValue("outcome")),
	}
	what := "“" + req.Key + "” of tenant " + req.Tenant
	switch req.Outcome {
	case idemkv.ResolveCommitted:
		req.RemoteSystem = strings.TrimSpace(r.PostFormValue("remote_system"))
		req.RemoteID = strings.TrimSpace(r.PostFormValue("remote_id"))
		req.RemoteURL = strings.TrimSpace(r.PostFormValue("remote_url"))
	case idemkv.ResolveNotExecuted:
		if r.PostFormValue("confirm") != "yes" {
			return back, notice{Msg: "Not resolved: tick the box to confirm that the effect did not happen.", Err: true}
		}
	}
	res, err := s.apiClient(r, v).Resolve(r.Context(), req)
	if err != nil {
		return back, failed("Resolving "+what, req.Tenant, req.Key, err)
	}
	if res.Receipt != nil {
		return back, notice{Msg: "Resolved " + what + " as committed: " + res.Receipt.RemoteSystem + " " + res.Receipt.RemoteID + ". Retries now replay this receipt."}
	}
	return back, notice{Msg: "Resolved " + what + " as not executed: the key is released, and the next attempt executes."}
}

// failed is the notice of an action on the record tenant/key that the API refused or
// could not finish: what it means, and a link to the record.
func failed(doing, tenant, key string, err error) notice {
	return notice{Msg: doing + " failed: " + describe(err).String(), Err: true, Tenant: tenant, Key: key}
}

func (s *Server) approvals(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page = "Approvals", "approvals", "approvals"
	tenant, choices := tenantChoice(r, v)
	_, every := v.tenants()
	b := listBody{Tenant: tenant, Choices: choices, Every: every, Return: r.URL.RequestURI(), Approver: v.principal == nil}
	if tenant != "" {
		b.Asked = true
		res, err := s.apiClient(r, v).Approvals(r.Context(), &idemkv.ApprovalsRequest{Tenant: tenant, Limit: pageSize, After: r.URL.Query().Get("after")})
		d.Err = describeRead(err)
		if res != nil {
			b.Records, b.Next = res.Approvals, res.Next
		}
	}
	b.allow(v)
	d.Body = b
}

// decide approves or denies; the approver is the token's name, so the record says who
// decided, not what a form claimed.
func (s *Server) decide(_ http.ResponseWriter, r *http.Request, v viewer) (string, notice) {
	back := localPath(r.PostFormValue("next"), Prefix+"approvals")
	req := &idemkv.DecideApprovalRequest{
		Tenant: r.PostFormValue("tenant"), Key: r.PostFormValue("key"),
		ApprovalID: r.PostFormValue("approval_id"), Fingerprint: r.PostFormValue("fingerprint"),
		Decision: idemkv.ApprovalVerdict(r.PostFormValue("decision")),
		Reason:   strings.TrimSpace(r.PostFormValue("reason")),
	}
	if v.principal != nil {
		req.Approver = v.principal.Name
	} else {
		req.Approver = strings.TrimSpace(r.PostFormValue("approver"))
	}
	what := "“" + req.Key + "” of tenant " + req.Tenant
	rec, err := s.apiClient(r, v).DecideApproval(r.Context(), req)
	if err != nil {
		return back, failed("Deciding "+what, req.Tenant, req.Key, err)
	}
	verb := "Approved"
	if rec.Approval != nil && rec.Approval.State == idemkv.ApprovalDenied {
		verb = "Denied"
	}
	return back, notice{Msg: verb + " " + what + " as " + req.Approver + "."}
}

type conflictsBody struct {
	Entries []ConflictEntry
	Next    uint64
	Kept    int    // of the viewer's tenants
	Dropped uint64 // of every tenant: shown only to a viewer of every tenant
	Cap     int
	Every   bool // the viewer reads every tenant
}

func (s *Server) conflictsPage(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page = "Conflicts", "conflicts", "conflicts"
	before, _ := strconv.ParseUint(r.URL.Query().Get("before"), 10, 64)
	var b conflictsBody
	b.Entries, b.Next, b.Kept, b.Dropped = s.conflicts.Page(before, pageSize, func(e *ConflictEntry) bool { return v.may(api.OpRead, e.Tenant) })
	b.Cap = s.conflicts.capacity()
	// What the node let go counts every tenant's.
	if _, b.Every = v.tenants(); !b.Every {
		b.Dropped = 0
	}
	d.Body = b
}

func (s *Server) records(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page = "Search", "records", "records"
	tenant, choices := tenantChoice(r, v)
	_, every := v.tenants()
	q := r.URL.Query()
	b := listBody{Tenant: tenant, Choices: choices, Every: every, Prefix: q.Get("prefix"), Status: q.Get("status")}
	if tenant != "" {
		b.Asked = true
		res, err := s.apiClient(r, v).List(r.Context(), &idemkv.ListRequest{Tenant: tenant, Prefix: b.Prefix,
			Status: idemkv.Status(b.Status), Limit: pageSize, After: q.Get("after")})
		d.Err = describeRead(err)
		if res != nil {
			b.Records, b.Next = res.Records, res.Next
		}
	}
	d.Body = b
}

type recordBody struct {
	Tenant, Key string
	Record      *idemkv.Record
	// Released is the tombstone of a record that was released there, when the key
	// holds no record: the API's not_found carries it.
	Released *idemkv.Tombstone
	CanWrite bool
	CanVote  bool
	Approver bool
	Return   string
}

func (s *Server) record(r *http.Request, v viewer, d *pageData) {
	d.Title, d.Nav, d.page = "Record", "records", "record"
	q := r.URL.Query()
	b := recordBody{Tenant: q.Get("tenant"), Key: q.Get("key"), Return: r.URL.RequestURI(), Approver: v.principal == nil}
	rec, err := s.apiClient(r, v).Get(r.Context(), &idemkv.GetRequest{Tenant: b.Tenant, Key: b.Key, History: true})
	var e *idemkv.Error
	if errors.As(err, &e) && e.Details != nil && e.Details.Released != nil {
		// No record, but the story of the one released here: the page shows it, not
		// an error.
		b.Released, err = e.Details.Released, nil
	}
	d.Err = describeRead(err)
	b.Record = rec
	b.CanWrite, b.CanVote = v.may(api.OpWrite, b.Tenant), v.may(api.OpApprove, b.Tenant)
	d.Body = b
}
