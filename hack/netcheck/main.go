// Command netcheck is the one image of the network-policy test on the test node
// (tests/node/test_network_policies.py): a static Go program with no dependencies, packed like the
// pause image.  One binary, three roles, chosen by the first argument:
//
//	netcheck serve  - a TCP server on :8080 that answers every connection with "hello from <pod>\n"
//	netcheck dns    - a DNS server on :53 (UDP and TCP) that answers every A question with 192.0.2.53
//	netcheck agent  - an HTTP server on :8081 the test asks to connect elsewhere, from inside the pod:
//	                  GET /tcp?to=IP:PORT  -> {"ok": bool, "reply"|"error": string}
//	                  GET /dns?server=IP:53&name=NAME -> {"ok": bool, "address"|"error": string}
//
// Each attempt is bounded (2 s); the agent only ever connects where the test says, and the test
// only says pod addresses on the node's own bridge.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

const timeout = 2 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve|dns|agent")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve()
	case "dns":
		err = dnsServer()
	case "agent":
		err = agent()
	default:
		err = fmt.Errorf("unknown role %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve() error {
	listener, err := net.Listen("tcp", ":8080")
	if err != nil {
		return err
	}
	name, _ := os.Hostname()
	for {
		conn, err := listener.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(timeout))
			fmt.Fprintf(conn, "hello from %s\n", name)
		}()
	}
}

// answer builds the reply to one DNS query: the question echoed, one A record 192.0.2.53.
func answer(query []byte) ([]byte, error) {
	if len(query) < 12 {
		return nil, errors.New("short query")
	}
	end := 12
	for end < len(query) && query[end] != 0 {
		end += int(query[end]) + 1
	}
	end += 5 // the root label, QTYPE, QCLASS
	if end > len(query) {
		return nil, errors.New("truncated question")
	}
	reply := make([]byte, 0, end+16)
	reply = append(reply, query[0], query[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0)
	reply = append(reply, query[12:end]...)
	reply = append(reply, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 53)
	return reply, nil
}

func dnsServer() error {
	udp, err := net.ListenPacket("udp", ":53")
	if err != nil {
		return err
	}
	tcp, err := net.Listen("tcp", ":53")
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(timeout))
				var size uint16
				if binary.Read(conn, binary.BigEndian, &size) != nil {
					return
				}
				query := make([]byte, size)
				if _, err := io.ReadFull(conn, query); err != nil {
					return
				}
				if reply, err := answer(query); err == nil {
					_ = binary.Write(conn, binary.BigEndian, uint16(len(reply)))
					_, _ = conn.Write(reply)
				}
			}()
		}
	}()
	buffer := make([]byte, 512)
	for {
		n, from, err := udp.ReadFrom(buffer)
		if err != nil {
			return err
		}
		if reply, err := answer(buffer[:n]); err == nil {
			_, _ = udp.WriteTo(reply, from)
		}
	}
}

func reply(w http.ResponseWriter, result map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(result)
}

func agent() error {
	mux := http.NewServeMux()
	mux.HandleFunc("/tcp", func(w http.ResponseWriter, r *http.Request) {
		conn, err := net.DialTimeout("tcp", r.URL.Query().Get("to"), timeout)
		if err != nil {
			reply(w, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			reply(w, map[string]any{"ok": false, "error": err.Error()})
			return
		}
		reply(w, map[string]any{"ok": true, "reply": line})
	})
	mux.HandleFunc("/dns", func(w http.ResponseWriter, r *http.Request) {
		server := r.URL.Query().Get("server")
		resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: timeout}).DialContext(ctx, "udp", server)
		}}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		addresses, err := resolver.LookupHost(ctx, r.URL.Query().Get("name"))
		if err != nil || len(addresses) == 0 {
			reply(w, map[string]any{"ok": false, "error": fmt.Sprint(err)})
			return
		}
		reply(w, map[string]any{"ok": true, "address": addresses[0]})
	})
	server := &http.Server{Addr: ":8081", Handler: mux, ReadHeaderTimeout: timeout}
	return server.ListenAndServe()
}
