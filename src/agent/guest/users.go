package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// User is an account of the guest's /etc/passwd, resolved by the agent itself (no libc, no NSS: the image
// may have neither).
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
	Shell  string
}

var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

func readColonFile(path string, fields int, each func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) < fields {
			continue
		}
		if !each(parts) {
			break
		}
	}
	return scanner.Err()
}

// lookupUser resolves a user name; not_found names it.
func lookupUser(op, name string) (*User, error) {
	var found *User
	_ = readColonFile(passwdFile, 7, func(p []string) bool {
		if p[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(p[2], 10, 32)
		gid, err2 := strconv.ParseUint(p[3], 10, 32)
		if err1 == nil && err2 == nil {
			found = &User{Name: name, UID: uint32(uid), GID: uint32(gid), Home: p[5], Shell: p[6]}
		}
		return false
	})
	if found == nil {
		return nil, notFound("%s: no user %q in the guest's %s", op, name, passwdFile)
	}
	found.Groups = []uint32{found.GID}
	_ = readColonFile(groupFile, 4, func(p []string) bool {
		for _, member := range strings.Split(p[3], ",") {
			if member == name {
				if gid, err := strconv.ParseUint(p[2], 10, 32); err == nil && uint32(gid) != found.GID {
					found.Groups = append(found.Groups, uint32(gid))
				}
			}
		}
		return true
	})
	if found.Home == "" {
		found.Home = "/"
	}
	return found, nil
}

// idNames maps uids and gids to names for FileInfo (read once per op).
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

func loadIDNames() *idNames {
	n := &idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
	_ = readColonFile(passwdFile, 7, func(p []string) bool {
		if id, err := strconv.ParseUint(p[2], 10, 32); err == nil {
			if _, dup := n.users[uint32(id)]; !dup {
				n.users[uint32(id)] = p[0]
			}
		}
		return true
	})
	_ = readColonFile(groupFile, 4, func(p []string) bool {
		if id, err := strconv.ParseUint(p[2], 10, 32); err == nil {
			if _, dup := n.groups[uint32(id)]; !dup {
				n.groups[uint32(id)] = p[0]
			}
		}
		return true
	})
	return n
}

func (n *idNames) user(uid uint32) string {
	if name, ok := n.users[uid]; ok && len(name) <= 64 {
		return name
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (n *idNames) group(gid uint32) string {
	if name, ok := n.groups[gid]; ok && len(name) <= 64 {
		return name
	}
	return strconv.FormatUint(uint64(gid), 10)
}
